"""Reading and writing models: ``load`` (the checker, external data, densifying sparse initializers) and
``save`` (the one atomic write, fsync, external data, the early write, JSON records).
"""
