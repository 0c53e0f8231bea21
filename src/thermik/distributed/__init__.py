"""thermik.distributed"""
