"""thermik.training"""
