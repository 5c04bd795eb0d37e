"""How chats-schema1.sqlite3 and chats-schema2.sqlite3 were made: by the chat store of a main
checkout of that schema (the commits are in docs/thinking.md), run as
`PYTHONPATH=<main>/src python make_old_db.py OUT_FOLDER`; the database is
OUT_FOLDER/chats.sqlite3 (tests/app/test_thinking_app.py migrates copies)."""

import shutil
import sys
from pathlib import Path

from merlin.app.model import store as st

print(st.__file__, st.SCHEMA_VERSION)
out = Path(sys.argv[1])
shutil.rmtree(out, ignore_errors=True)
out.mkdir(parents=True)
s = st.Store(out)
cid = s.create_conversation("Capitals")
s.add_message(cid, "user", "What is the capital of France?")
mid = s.add_message(cid, "assistant", "", state="streaming")
stats = {"reason": "stop_token", "tokens": 3, "token_ids": [1, 2, 3]}
s.update_message(mid, "Paris.", "done", stats)
cid2 = s.create_conversation("Second chat")
s.add_message(cid2, "user", "Hello")
s.add_message(cid2, "assistant", "Hi there.")
s.close()
