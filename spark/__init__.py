"""PySpark jobs over kfan captures (``spark/replay.py``); installed with kfan so `kfan replay` finds them."""
