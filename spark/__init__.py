"""PySpark jobs over kfan captures: ``spark/replay.py`` (the job) and ``spark/checks.py`` (the per-exchange checks it runs);
installed with kfan so `kfan replay` finds them."""
