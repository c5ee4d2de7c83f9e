"""The ingress process: the OpenAI API, its route groups and what only it uses."""
