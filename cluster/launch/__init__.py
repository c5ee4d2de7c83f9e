"""The roof: the `toolserve` command, the local launcher, the Redis it starts and
the demo. It may import anything; nothing in the project imports it."""
