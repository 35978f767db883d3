"""The parts of perf/soak.py, which runs minutes of mixed, checked traffic on one shmserve and
watches its processes for growth: the requests counted and what the server must count (tally),
the unary and shared-memory clients (clients) and the streaming ones (streams), the threads that
run them and hold them for a quiescent sample (traffic), what the server holds (samples), the
judgement of growth and the table (report), and the run (runner). perf/ is on sys.path when the
script runs, so perf/servers.py is `servers`."""
