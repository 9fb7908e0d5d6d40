#!/usr/bin/env python3
"""Turns a checkpoint written by this tetrad into one as an older tetrad wrote it, for the tests
of resuming old checkpoints (tests/command_safety.sh resume_old): the records it did not keep yet
are removed and the checksums that cover them written again.

  old_checkpoint.py state DIR KEY...      trainer_state.bin (the previous, HF-folder format):
                                          removes KEY... from its "info" (e.g. data: the data
                                          record, kept since the data fingerprint)
  old_checkpoint.py meta DIR KEY...       meta.json (the sharded format): removes data.KEY...
                                          from its "data" record (e.g. seed fingerprint)
  old_checkpoint.py poison DIR VALUE N [AT [ARRAY]]
                                          not an old format but a damaged state no reader's
                                          checksum catches (the sharded format): N values from
                                          element AT (default 0) of shard_00000.bin's first
                                          piece of ARRAY (params, the default: the first
                                          tensor's weights; adam_m, adam_v) set to VALUE (inf,
                                          nan), its chunk checksums and meta.json's written
                                          again: a checkpoint of weights that are not finite,
                                          which import refuses to make (tests/command_safety.sh
                                          final_state, verify)
  old_checkpoint.py poison_legacy DIR TENSOR VALUE AT
                                          the same in the previous format: element AT (flat, in
                                          the file's layout) of TENSOR in model.safetensors set
                                          to VALUE, its hash in trainer_state.bin and that
                                          file's checksum written again

Formats: src/tetrad/checkpoint/trainer_state.hpp (magic, version, JSON length, JSON, arrays,
XXH64 of every byte before it) and sharded.hpp (meta.json self-checksummed: XXH64 of its compact
JSON without "checksum"). XXH64 is written out here: Debian's python3 has no xxhash module.
"""
import json
import struct
import sys

M = (1 << 64) - 1
P1, P2, P3, P4, P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
                      0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5)


def rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M


def rnd(acc, lane):
    acc = (acc + lane * P2) & M
    return (rotl(acc, 31) * P1) & M


def merge(acc, v):
    acc ^= rnd(0, v)
    return (acc * P1 + P4) & M


def xxh64(data, seed=0):
    n, i = len(data), 0
    if n >= 32:
        v = [(seed + P1 + P2) & M, (seed + P2) & M, seed, (seed - P1) & M]
        while i + 32 <= n:
            lanes = struct.unpack_from("<4Q", data, i)
            v = [rnd(v[k], lanes[k]) for k in range(4)]
            i += 32
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & M
        for x in v:
            h = merge(h, x)
    else:
        h = (seed + P5) & M
    h = (h + n) & M
    while i + 8 <= n:
        h ^= rnd(0, struct.unpack_from("<Q", data, i)[0])
        h = (rotl(h, 27) * P1 + P4) & M
        i += 8
    if i + 4 <= n:
        h ^= (struct.unpack_from("<I", data, i)[0] * P1) & M
        h = (rotl(h, 23) * P2 + P3) & M
        i += 4
    while i < n:
        h ^= (data[i] * P5) & M
        h = (rotl(h, 11) * P1) & M
        i += 1
    h ^= h >> 33
    h = (h * P2) & M
    h ^= h >> 29
    h = (h * P3) & M
    h ^= h >> 32
    return h


def fail(msg):
    sys.exit("old_checkpoint.py: " + msg)


def old_state(path, keys):
    raw = open(path, "rb").read()
    if raw[:8] != b"TTRDSTAT":
        fail(path + ": not a trainer state")
    if struct.unpack_from("<Q", raw, len(raw) - 8)[0] != xxh64(raw[:-8]):
        fail(path + ": its checksum does not verify before the change (XXH64 written out wrong?)")
    (jlen,) = struct.unpack_from("<Q", raw, 12)
    head = json.loads(raw[20:20 + jlen])
    for k in keys:
        if k not in head["info"]:
            fail(path + ": info has no '" + k + "'")
        del head["info"][k]
    text = json.dumps(head, separators=(",", ":")).encode()
    body = raw[:12] + struct.pack("<Q", len(text)) + text + raw[20 + jlen:-8]
    open(path, "wb").write(body + struct.pack("<Q", xxh64(body)))


def meta_sum(meta):
    m = {k: v for k, v in meta.items() if k != "checksum"}
    return "%016x" % xxh64(json.dumps(m, separators=(",", ":"), sort_keys=True,
                                      ensure_ascii=False).encode())


def old_meta(path, keys):
    meta = json.load(open(path))
    if meta_sum(meta) != meta["checksum"]:
        fail(path + ": the checksum computed here differs from the recorded one before the change")
    for k in keys:
        if k not in meta["data"]:
            fail(path + ": data has no '" + k + "'")
        del meta["data"][k]
    meta["checksum"] = meta_sum(meta)
    json.dump(meta, open(path, "w"), indent=1)


SHARD_HEADER_BYTES = 64  # sharded.hpp's kShardHeaderBytes


def poison(ckpt, value, n, first=0, array="params"):
    meta_path = ckpt + "/meta.json"
    meta = json.load(open(meta_path))
    if meta_sum(meta) != meta["checksum"]:
        fail(meta_path + ": the checksum computed here differs from the recorded one before the change")
    f = next(f for f in meta["files"] if f["name"] == "shard_00000.bin")
    piece = next((p for p in f["pieces"] if meta["arrays"][p["array"]] == array), None)
    if piece is None or piece["numel"] < first + n:
        fail(meta_path + ": the first %s piece of shard_00000.bin does not hold elements %d to %d"
             % (array, first, first + n - 1))
    path = ckpt + "/shard_00000.bin"
    b = bytearray(open(path, "rb").read())
    chunk = meta["chunk_bytes"]
    start = piece["offset"] + 4 * first
    b[SHARD_HEADER_BYTES + start:SHARD_HEADER_BYTES + start + 4 * n] = struct.pack("<f", value) * n
    for c in range(start // chunk, (start + 4 * n - 1) // chunk + 1):
        lo = SHARD_HEADER_BYTES + c * chunk
        hi = min(SHARD_HEADER_BYTES + f["data_bytes"], lo + chunk)
        f["chunk_xxh64"][c] = "%016x" % xxh64(bytes(b[lo:hi]))
    open(path, "wb").write(b)
    meta["checksum"] = meta_sum(meta)
    json.dump(meta, open(meta_path, "w"), indent=1)


def poison_legacy(ckpt, tensor, value, at):
    path = ckpt + "/model.safetensors"
    b = bytearray(open(path, "rb").read())
    (n,) = struct.unpack_from("<Q", b, 0)
    t = json.loads(b[8:8 + n])[tensor]
    if t["dtype"] != "F32":
        fail(path + ": " + tensor + " is not F32")
    pos = 8 + n + t["data_offsets"][0] + 4 * at
    b[pos:pos + 4] = struct.pack("<f", value)
    open(path, "wb").write(b)
    state = ckpt + "/trainer_state.bin"
    raw = open(state, "rb").read()
    if raw[:8] != b"TTRDSTAT" or struct.unpack_from("<Q", raw, len(raw) - 8)[0] != xxh64(raw[:-8]):
        fail(state + ": not a trainer state whose checksum verifies")
    (jlen,) = struct.unpack_from("<Q", raw, 12)
    head = json.loads(raw[20:20 + jlen])
    head["info"]["checkpoint_files"]["model.safetensors"] = "%016x" % xxh64(bytes(b))
    text = json.dumps(head, separators=(",", ":")).encode()
    body = raw[:12] + struct.pack("<Q", len(text)) + text + raw[20 + jlen:-8]
    open(state, "wb").write(body + struct.pack("<Q", xxh64(body)))


if len(sys.argv) < 4 or sys.argv[1] not in ("state", "meta", "poison", "poison_legacy"):
    fail("usage: old_checkpoint.py state|meta CHECKPOINT_DIR KEY... | poison CHECKPOINT_DIR VALUE N "
         "[AT [ARRAY]] | poison_legacy CHECKPOINT_DIR TENSOR VALUE AT")
if sys.argv[1] == "poison":
    poison(sys.argv[2], float(sys.argv[3]), int(sys.argv[4]),
           int(sys.argv[5]) if len(sys.argv) > 5 else 0, sys.argv[6] if len(sys.argv) > 6 else "params")
elif sys.argv[1] == "poison_legacy":
    poison_legacy(sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5]))
elif sys.argv[1] == "state":
    old_state(sys.argv[2] + "/trainer_state.bin", sys.argv[3:])
else:
    old_meta(sys.argv[2] + "/meta.json", sys.argv[3:])
