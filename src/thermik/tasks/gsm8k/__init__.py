"""GSM8K-style math word problems, single turn."""
