"""Reading and writing files: ``load`` (the checker, external data, densifying sparse initializers), ``save`` (the
one atomic write, fsync, external data, the early write, JSON records), ``paths`` (every path a run writes, checked
before any work) and Polygraphy's input JSON.
"""
