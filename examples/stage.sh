# Sourced by the examples' run.sh: `stage NAME COMMAND...` runs the command and appends its wall time to $TIMES as a
# json line {"stage": NAME, "seconds": S} (their report.py reads it).
stage() {
  local name=$1 start=$SECONDS
  shift
  "$@"
  echo "{\"stage\": \"$name\", \"seconds\": $((SECONDS - start))}" >> "$TIMES"
}
