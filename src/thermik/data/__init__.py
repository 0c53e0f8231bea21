"""thermik.data"""
