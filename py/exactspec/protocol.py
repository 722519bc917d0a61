"""The one message envelope {kind, request_id, seq, epoch, payload}, checked against protocol.json.

An Inbox applies messages in order and drops (and counts) those from a stale epoch, a foreign
request or a duplicate/out-of-order seq. Pure Python; the JS side reads the same protocol.json.
"""
from __future__ import annotations

import json
import os

from .errors import E_PROTOCOL, ExactSpecError

with open(os.path.join(os.path.dirname(__file__), "protocol.json"), encoding="utf-8") as _f:
    SCHEMA = json.load(_f)
KINDS = SCHEMA["kinds"]


def make_envelope(kind: str, request_id: str, seq: int, epoch: int, payload: dict) -> dict:
    env = {"kind": kind, "request_id": request_id, "seq": seq, "epoch": epoch, "payload": payload}
    validate_envelope(env)
    return env


def validate_envelope(env) -> None:
    if not isinstance(env, dict) or set(env) != set(SCHEMA["envelope"]):
        raise ExactSpecError(E_PROTOCOL, f"envelope fields must be {SCHEMA['envelope']}")
    if not isinstance(env["kind"], str) or env["kind"] not in KINDS:   # a list or dict is unhashable
        raise ExactSpecError(E_PROTOCOL, f"unknown message kind {env['kind']!r}")
    for key in ("seq", "epoch"):
        if not isinstance(env[key], int) or isinstance(env[key], bool) or env[key] < 0:
            raise ExactSpecError(E_PROTOCOL, f"{key} must be a non-negative integer")
    if not isinstance(env["request_id"], str) or not isinstance(env["payload"], dict):
        raise ExactSpecError(E_PROTOCOL, "request_id must be a string and payload an object")
    missing = [f for f in KINDS[env["kind"]] if f not in env["payload"]]
    if missing:
        raise ExactSpecError(E_PROTOCOL, f"{env['kind']} payload lacks {missing}")


class Inbox:
    """Receiver side: accepts only the current request and epoch, in seq order."""

    def __init__(self, request_id: str, epoch: int = 0):
        self.request_id = request_id
        self.epoch = epoch
        self.next_seq = 0
        self.accepted: list[dict] = []
        self.dropped_stale = 0

    def advance_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def offer(self, env: dict) -> bool:
        validate_envelope(env)
        if env["request_id"] != self.request_id or env["epoch"] != self.epoch or env["seq"] < self.next_seq:
            self.dropped_stale += 1
            return False
        self.next_seq = env["seq"] + 1
        self.accepted.append(env)
        return True
