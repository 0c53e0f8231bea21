"""thermik.envs"""
