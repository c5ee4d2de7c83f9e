"""Preparing prompts in a replica's chat front end: the tokenize cache."""
