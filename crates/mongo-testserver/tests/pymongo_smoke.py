"""PyMongo against mongo-testserver: run by tests/pymongo.rs as `python3 pymongo_smoke.py URI`.

Connects with PyMongo (directConnection=true, after PyMongo's OP_QUERY/OP_MSG handshake),
inserts, finds, updates with a pipeline, upserts with find_one_and_update, creates a TTL index
and reads everything back. Exits 0 when every check holds; otherwise prints what differed.
"""

import datetime
import sys

import pymongo
from pymongo import ReturnDocument
from pymongo.errors import DuplicateKeyError


def check(what, got, want):
    if got != want:
        raise AssertionError(f"{what}: expected {want!r}, got {got!r}")
    print(f"ok: {what}")


def main(uri):
    client = pymongo.MongoClient(
        uri, directConnection=True, serverSelectionTimeoutMS=10000, appname="pymongo-smoke"
    )
    check("ping", client.admin.command("ping").get("ok"), 1.0)
    hello = client.admin.command("hello")
    check("hello isWritablePrimary", hello.get("isWritablePrimary"), True)

    db = client["pymongo_smoke"]
    db.drop_collection("items")
    items = db["items"]

    # Inserts.
    result = items.insert_one({"_id": "a", "n": 1, "tags": ["x"]})
    check("insert_one inserted_id", result.inserted_id, "a")
    result = items.insert_many([{"_id": "b", "n": 2}, {"_id": "c", "n": 3}])
    check("insert_many inserted_ids", result.inserted_ids, ["b", "c"])
    try:
        items.insert_one({"_id": "a"})
        raise AssertionError("a duplicate _id was accepted")
    except DuplicateKeyError as e:
        check("duplicate _id error code", e.code, 11000)

    # Finds.
    docs = list(items.find({"n": {"$gte": 2}}).sort("n", pymongo.DESCENDING))
    check("find n >= 2 sorted desc", [d["_id"] for d in docs], ["c", "b"])
    check("find_one projection", items.find_one({"_id": "a"}, {"_id": 0, "n": 1}), {"n": 1})
    many = list(items.find({}, batch_size=1).sort("_id", 1))
    check("find with batch_size 1 (getMore)", [d["_id"] for d in many], ["a", "b", "c"])
    check("estimated_document_count", items.estimated_document_count(), 3)

    # Update with a pipeline ($$NOW, field paths, $add).
    result = items.update_one(
        {"_id": "b"},
        [{"$set": {"n": {"$add": ["$n", 10]}, "touched": "$$NOW"}}],
    )
    check("pipeline update matched/modified", (result.matched_count, result.modified_count), (1, 1))
    b = items.find_one({"_id": "b"})
    check("pipeline update n", b["n"], 12)
    check("pipeline update $$NOW is a date", isinstance(b["touched"], datetime.datetime), True)

    # Operator updates.
    result = items.update_many({}, {"$inc": {"n": 1}})
    check("update_many modified", result.modified_count, 3)
    items.update_one({"_id": "a"}, {"$push": {"tags": {"$each": ["y", "z"]}}})
    check("$push $each", items.find_one({"_id": "a"})["tags"], ["x", "y", "z"])

    # find_one_and_update with upsert: first inserts (with $setOnInsert), then updates.
    doc = items.find_one_and_update(
        {"_id": "lock"},
        {"$inc": {"count": 1}, "$setOnInsert": {"created": True}},
        upsert=True,
        return_document=ReturnDocument.AFTER,
    )
    check("upsert via find_one_and_update", doc, {"_id": "lock", "count": 1, "created": True})
    doc = items.find_one_and_update(
        {"_id": "lock"},
        {"$inc": {"count": 1}, "$setOnInsert": {"created": False}},
        upsert=True,
        return_document=ReturnDocument.BEFORE,
    )
    check("find_one_and_update returns the document before", doc["count"], 1)
    check("$setOnInsert not applied on update", items.find_one({"_id": "lock"})["created"], True)
    missing = items.find_one_and_update({"_id": "nope"}, {"$set": {"x": 1}})
    check("find_one_and_update without a match", missing, None)

    # TTL index.
    name = items.create_index([("expiresAt", pymongo.ASCENDING)], expireAfterSeconds=0)
    check("create_index name", name, "expiresAt_1")
    info = items.index_information()
    check("index names", sorted(info), ["_id_", "expiresAt_1"])
    check("TTL index expireAfterSeconds", info["expiresAt_1"].get("expireAfterSeconds"), 0)
    later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
    items.update_one({"_id": "lock"}, {"$set": {"expiresAt": later}})
    stored = items.find_one({"_id": "lock"})["expiresAt"]
    check(
        "date round trip (ms precision)",
        stored.replace(tzinfo=datetime.timezone.utc),
        later.replace(microsecond=later.microsecond // 1000 * 1000),
    )

    # Delete, then read everything back.
    check("delete_one", items.delete_one({"_id": "c"}).deleted_count, 1)
    final = {d["_id"]: d.get("n") for d in items.find().sort("_id", 1)}
    check("final contents", final, {"a": 2, "b": 13, "lock": None})
    check("list_collection_names", "items" in db.list_collection_names(), True)

    db.drop_collection("items")
    check("drop_collection", "items" in db.list_collection_names(), False)
    client.close()
    print("pymongo smoke: all checks passed")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: pymongo_smoke.py MONGODB_URI")
    main(sys.argv[1])
