# Sourced by bench/run-*.sh: sets $python to an interpreter that has matplotlib ($PYTHON if
# given; a pyenv python3 earlier on PATH may lack Debian's python3-matplotlib).
python=${PYTHON:-}
if [[ -z $python ]]; then
  for p in python3 /usr/bin/python3; do
    if command -v "$p" >/dev/null && "$p" -c 'import matplotlib' 2>/dev/null; then python=$p; break; fi
  done
  python=${python:-python3}
fi
