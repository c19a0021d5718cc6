"""What a run is asked to do: FixOptions with its one value validator, and the TOML target profiles
(``profiles/*.toml``) that fill it.
"""
