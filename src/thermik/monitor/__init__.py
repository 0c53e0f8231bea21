"""thermik.monitor"""
