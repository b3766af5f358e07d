#!/usr/bin/env bash
# A tour of runner on the embedded SQLite default, in a private temporary directory.
# Everything here is synthetic: made-up tenants, leads and aliases.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
RUNNER=${RUNNER:-$here/.venv/bin/runner}
work=$(mktemp -d "${TMPDIR:-/tmp}/runner-demo.XXXXXX")   # mode 0700
trap 'rm -rf "$work"' EXIT
cd "$work"

show() { printf '\n$ %s\n' "$*" | sed "s#$RUNNER#runner#"; "$@"; }

cat > scope.json <<'JSON'
{"tenant_id": "demo-tenant", "account_id": "demo-account", "page_id": "demo-page", "form_id": "demo-form"}
JSON
for i in 1 2 3 4; do
  cat > "event-$i.json" <<JSON
{"tenant_id": "demo-tenant", "account_id": "demo-account", "page_id": "demo-page",
 "form_id": "demo-form", "source": "meta", "source_lead_id": "demo-lead-$i",
 "synthetic": true, "contact_alias": "synthetic-alias-$i"}
JSON
done
sed 's/demo-tenant"/other-tenant"/' event-1.json > outside-scope.json

echo "# runner demo in $work"
echo "# 1. accept three synthetic events (each answer comes after its commit)"
for i in 1 2 3; do
  show "$RUNNER" accept --db queue.db --scope scope.json --record "event-$i.json" 2>/dev/null
done
echo
echo "# 2. the same event again is a duplicate: nothing changes, same write_id"
show "$RUNNER" accept --db queue.db --scope scope.json --record event-1.json 2>/dev/null
echo
echo "# 3. an event outside the pinned scope is rejected (exit 65) and nothing is stored"
show "$RUNNER" accept --db queue.db --scope scope.json --record outside-scope.json 2>&1 \
  || echo "(exit $?)"
echo
echo "# 4. one cycle delivers them to the synthetic target (a SQLite 'spreadsheet'):"
echo "#    mark in_flight (committed) -> write -> read back -> confirmed"
show "$RUNNER" once --db queue.db --scope scope.json --target target.db 2>/dev/null
echo
echo "# 5. a crash right after the target committed a write (exit 73): the record is left"
echo "#    in_flight, and runner cannot know whether the write happened"
show "$RUNNER" accept --db queue.db --scope scope.json --record event-4.json 2>/dev/null
show "$RUNNER" once --db queue.db --scope scope.json --target target.db --fault crash-after-write \
  2>&1 | grep -Ev '^[0-9T:.Z-]+ +(lead|batch)\.in_flight ' || echo "(exit ${PIPESTATUS[0]})"
echo
echo "# 6. the restart never resends it: in_flight becomes uncertain, and an exact readback"
echo "#    by write_id proves the write happened -> confirmed, attempts still 1"
show "$RUNNER" once --db queue.db --scope scope.json --target target.db
echo
echo "# 7. the CRM changes a lead's status; the poll pass after each cycle notices it"
python3 -c "import sqlite3; c = sqlite3.connect('target.db'); \
c.execute(\"UPDATE sheet SET status = 'qualified' WHERE source_lead_id = 'demo-lead-2'\"); c.commit()"
show "$RUNNER" start --db queue.db --scope scope.json --target target.db --cycles 1
echo
echo "# 8. status: every state counted, the oldest uncertain records, the outbox (no contact"
echo "#    fields); --records lists every record, one JSON line each (NDJSON)"
printf '\n$ runner status --db queue.db --scope scope.json | python3 -m json.tool\n'
"$RUNNER" status --db queue.db --scope scope.json | python3 -m json.tool --indent 2
show "$RUNNER" status --db queue.db --records
echo
echo "# 9. staged processing: the backlog per stage, then the four workers (one cycle each)"
echo "#    turn the outbox into D1 -> D2 -> D3 -> D4, and status shows the lead funnel"
show "$RUNNER" backlog --db queue.db
for w in raw-retriever core-processor generic-materializer domain-projector; do
  show "$RUNNER" worker "$w" --db queue.db --cycles 1
done
show "$RUNNER" backlog --db queue.db
printf '\n$ runner status --db queue.db | (the funnel)\n'
"$RUNNER" status --db queue.db | python3 -c "import json, sys; print(json.dumps(json.load(sys.stdin)['funnel']))"
echo
echo "# a forced replay recomputes terminal inputs; the previous results stay as history"
show "$RUNNER" job replay-core --db queue.db --force
echo
echo "# the target holds exactly one row per lead:"
python3 - <<'PY'
import sqlite3
rows = sqlite3.connect("target.db").execute(
    "SELECT source_lead_id, count(*) FROM sheet GROUP BY source_lead_id").fetchall()
for key, n in rows:
    print(f"  {key}: {n} row")
PY
echo
echo "# store files are private:"
ls -l queue.db* target.db | awk '{print "  " $1, $NF}'
