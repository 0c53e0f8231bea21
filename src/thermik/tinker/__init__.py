"""thermik.tinker"""
