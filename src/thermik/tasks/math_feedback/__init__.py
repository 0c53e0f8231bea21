"""Multi-turn math with feedback, on the gsm8k problems."""
