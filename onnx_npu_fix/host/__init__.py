"""What the machine a run is on gives it: how many cores the validation sessions may use (``cores``), and memory
freed in C / C++ handed back to the system (``heap``). Nothing here knows about models.
"""
