"""thermik.rollout"""
