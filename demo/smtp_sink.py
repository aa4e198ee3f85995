"""A tiny SMTP sink on loopback: the demo's mail provider, flaky at first.

``python -m demo.smtp_sink --dir .demo/mail [--flaky 4] [--reject-domain D]`` listens on
a free port of 127.0.0.1 and writes that port to ``<dir>/port``. It speaks just enough
SMTP for :mod:`smtplib` and answers each message at the end of its DATA:

* ``550`` when a recipient is at a rejected domain (a mailbox that does not exist: the
  layer dead-letters that as ``permanent``);
* ``451`` to the first ``--flaky`` other messages (the provider has a hiccup: a
  transient error, retried with backoff);
* ``250`` otherwise: the message is kept as ``<dir>/<n>.eml``.

Every answer is one JSON line in ``<dir>/log.jsonl`` (the demo and its test count them).
The standard library only: the demo needs no mail server and no extra dependency.
"""

from __future__ import annotations

import argparse
import json
import socketserver
import threading
from datetime import UTC, datetime
from email import message_from_bytes
from pathlib import Path
from typing import Any

#: the replies the sink gives at the end of DATA
ACCEPTED = "250 2.0.0 queued"
TRANSIENT = "451 4.3.0 provider busy, try again later"
MISSING = "550 5.1.1 mailbox unavailable"


class Sink:
    """What the sink decides and keeps; shared by the connection threads."""

    def __init__(self, folder: Path, flaky: int, reject: set[str]) -> None:
        self.folder = folder
        self.flaky_left = flaky
        self.reject = {domain.lower() for domain in reject}
        self.lock = threading.Lock()
        self.kept = 0

    def answer(self, recipients: list[str], data: bytes) -> str:
        """The reply to one message, logged; an accepted message is kept."""
        mail = message_from_bytes(data)
        domains = {r.rpartition("@")[2].lower() for r in recipients}
        with self.lock:
            if domains & self.reject:
                reply = MISSING
            elif self.flaky_left > 0:
                self.flaky_left -= 1
                reply = TRANSIENT
            else:
                self.kept += 1
                (self.folder / f"{self.kept:04d}.eml").write_bytes(data)
                reply = ACCEPTED
            line = {
                "at": datetime.now(UTC).isoformat(),
                "reply": int(reply[:3]),
                "message_id": mail["Message-ID"],
                "to": recipients,
            }
            with (self.folder / "log.jsonl").open("a") as log:
                log.write(json.dumps(line) + "\n")
        return reply


class Handler(socketserver.StreamRequestHandler):
    """One SMTP session: HELO/EHLO, MAIL, RCPT, DATA, RSET, NOOP, QUIT."""

    server: Server

    def say(self, line: str) -> None:
        self.wfile.write(line.encode("ascii") + b"\r\n")
        self.wfile.flush()

    def handle(self) -> None:
        self.say("220 sink.demo ESMTP ready")
        recipients: list[str] = []
        while raw := self.rfile.readline(65536):
            verb = raw.decode("utf-8", "replace").strip().split(" ", 1)[0].upper()
            if verb in ("EHLO", "HELO"):
                self.say("250 sink.demo")
            elif verb == "MAIL":
                recipients = []
                self.say("250 2.1.0 ok")
            elif verb == "RCPT":
                address = raw.decode("utf-8", "replace").split(":", 1)[-1].strip()
                recipients.append(address.split(" ", 1)[0].strip("<>"))
                self.say("250 2.1.5 ok")
            elif verb == "DATA":
                self.say("354 end with <CRLF>.<CRLF>")
                self.say(self.server.sink.answer(recipients, self.read_data()))
                recipients = []
            elif verb in ("RSET", "NOOP"):
                recipients = [] if verb == "RSET" else recipients
                self.say("250 2.0.0 ok")
            elif verb == "QUIT":
                self.say("221 2.0.0 bye")
                return
            else:
                self.say("502 5.5.2 not implemented")

    def read_data(self) -> bytes:
        lines: list[bytes] = []
        while (line := self.rfile.readline(65536)) and line.rstrip(b"\r\n") != b".":
            lines.append(line[1:] if line.startswith(b"..") else line)  # dot-unstuffing
        return b"".join(lines)


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, sink: Sink) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.sink = sink


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo.smtp_sink", description=__doc__)
    parser.add_argument("--dir", type=Path, required=True, help="where mails and log go")
    parser.add_argument("--flaky", type=int, default=0, help="answer 451 to this many first")
    parser.add_argument("--reject-domain", action="append", default=[], metavar="DOMAIN")
    args = parser.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    server = Server(Sink(args.dir, args.flaky, set(args.reject_domain)))
    port: Any = server.server_address[1]
    (args.dir / "port.tmp").write_text(str(port))
    (args.dir / "port.tmp").replace(args.dir / "port")  # appears whole or not at all
    print(f"smtp sink listening on 127.0.0.1:{port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
