"""A model replica's process: the model server, its continuation loop, the
prompt cache, and the replica's side of each engine mechanism."""
