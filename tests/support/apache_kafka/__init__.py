"""Apache Kafka itself, from Maven Central: the backend of record (see ../shared/BACKENDS.md, section 0)."""
