"""thermik.inference"""
