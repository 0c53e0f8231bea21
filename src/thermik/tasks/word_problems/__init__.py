"""Word problems solved with the calculator tool: GSM8K-style questions, one `calculate` call, then the answer."""
