"""thermik.eval"""
