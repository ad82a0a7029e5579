#!/usr/bin/env python3
"""A tiny todo-list CLI.

    todo.py add TEXT [--priority N]      add an item (priority 1 = most urgent, default 3)
    todo.py list [--all] [--limit N]     list open items (--all also shows done items)
    todo.py done ID                      mark item ID as done

Items are stored as JSON in the file named by $TODO_DB (default: ~/.todo.json).
`list` prints one line per item, most urgent first (lowest priority number,
then lowest id):

    3. [ ] (p1) pay rent
    1. [x] (p2) buy milk
"""
import argparse
import json
import os
import sys


def db_path():
    return os.environ.get("TODO_DB", os.path.expanduser("~/.todo.json"))


def load():
    try:
        with open(db_path()) as f:
            return json.load(f)
    except FileNotFoundError:
        return []


def save(items):
    with open(db_path(), "w") as f:
        json.dump(items, f, indent=2)


def cmd_add(args):
    items = load()
    new_id = max((i["id"] for i in items), default=0) + 1
    items.append({"id": new_id, "text": args.text, "priority": args.priority, "done": False})
    save(items)
    print(f"added {new_id}")


def cmd_list(args):
    items = load()
    if not args.all:
        items = [i for i in items if not i["done"]]
    items.sort(key=lambda i: (i["priority"], i["id"]))
    if args.limit is not None:
        items = items[:args.limit]
    for i in items:
        mark = "x" if i["done"] else " "
        print(f"{i['id']}. [{mark}] (p{i['priority']}) {i['text']}")


def cmd_done(args):
    items = load()
    for i in items:
        if i["id"] == args.id:
            i["done"] = True
            save(items)
            print(f"done {args.id}")
            return 0
    print(f"no such item: {args.id}", file=sys.stderr)
    return 1


def main(argv=None):
    p = argparse.ArgumentParser(prog="todo.py")
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("add")
    a.add_argument("text")
    a.add_argument("--priority", default=3)
    a.set_defaults(func=cmd_add)
    l = sub.add_parser("list")
    l.add_argument("--all", action="store_false")
    l.add_argument("--limit")
    l.set_defaults(func=cmd_list)
    d = sub.add_parser("done")
    d.add_argument("id")
    d.set_defaults(func=cmd_done)
    args = p.parse_args(argv)
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
