"""Reverse text: single turn, no tools."""
