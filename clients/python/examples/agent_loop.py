"""An agent loop: checkpoint at every turn's end, roll a failed turn back.

    python3 agent_loop.py SANDBOX     (with `turnsnap serve` running)
"""
import sys

from turnsnap import Client

c, name = Client(), sys.argv[1]
good = c.checkpoint(name, message="before the agent")["id"]
steps = ["echo 'print(1)' > /tmp/app.py", "rm -rf /tmp/*", "echo ok > /tmp/done"]
for turn, step in enumerate(steps, start=1):
    res = c.exec(name, ["sh", "-c", step])          # the agent's action
    tests = c.exec(name, ["sh", "-c", "test -e /tmp/app.py"])
    if res.exit_code == 0 and tests.exit_code == 0:
        cp = c.checkpoint(name, turn=turn, message=step)
        good = cp["id"]
        print("turn %d: %s, %s" % (turn, cp["class"], cp["id"][:12]))
    else:
        c.rollback(name, good)                      # undo the failed turn
        print("turn %d failed; rolled back to %s" % (turn, good[:12]))
