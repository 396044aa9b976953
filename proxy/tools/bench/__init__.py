"""``kfan bench``: what kfan costs, measured side by side with the direct path, for sizing.

One run measures the same default confluent-kafka clients twice: against
the brokers directly, and through a ``kfan serve`` child process started in
front of them. Brokers: the embedded 3-broker cluster in this process, or a
real cluster (``--bootstrap``). Phases, each on both paths:

1. produce throughput (MB/s of keys and values, first produce to flush done);
2. consume throughput (``assign()`` to the offsets the produce phase wrote);
3. kfan's CPU milliseconds per MB in each (its utime + stime from /proc), and
   from it how many MB/s one core of kfan carries;
4. produce latency, one small record at a time, p50 and p99;
5. slow-broker Fetch latency (embedded cluster only): consumer latency on a
   fast broker's partition while the other brokers answer Fetch late;
6. optionally, many clients at once (``--clients N``, :mod:`.clients`).

Against drift (heat, caches, a neighbour's load) neither path is always
first: throughput runs in rounds that swap the order, produce latency
alternates record by record (the order swapped every record), the slow-fetch
phase alternates blocks of 20 records.

The bench is plain synchronous code: confluent-kafka is synchronous, and the
kfan it measures is a separate process. It prints figures and never judges
them; no test asserts a time.

Modules: :mod:`.options` (the command's options), :mod:`.run` (orchestration
and progress), :mod:`.target` (brokers and topic), :mod:`.processes` (the
kfan child, shared with the tests), :mod:`.measure` and :mod:`.slow_fetch`
(the phases), :mod:`.report` (figures, table, JSON).
"""
