"""The process and its host: the command line, the `Server` that builds everything else and
runs it, systemd's notifications, the garbage collector's settings.

The top of the front: nothing else in shmserve imports from here (shmserve/cli.py and
shmserve/server.py only give the entry point and the in-process API their stable paths).
"""
