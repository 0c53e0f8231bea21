"""Built-in tasks, one package each."""
