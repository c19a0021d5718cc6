# Sourced by the install scripts: find_python X.Y prints an interpreter of that version (PYTHON overrides it).
find_python() {
    local want="$1" candidate
    if [ -n "${PYTHON:-}" ]; then echo "$PYTHON"; return; fi
    for candidate in "python$want" "$(pyenv root 2>/dev/null)/versions/$want"*/bin/python; do
        if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys' 2>/dev/null \
            && [ "$("$candidate" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" = "$want" ]; then
            echo "$candidate"; return
        fi
    done
    echo "no Python $want found (set PYTHON)" >&2
    return 1
}
