"""Compiler in the loop: run a judge command on candidate models, and reduce a model the judge rejects
to a minimal one that it still rejects with the same failure."""
