"""thermik.tools"""
