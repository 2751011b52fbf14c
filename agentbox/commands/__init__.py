"""Click commands, one module per group of verbs."""
