"""thermik.models"""
