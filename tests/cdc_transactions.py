"""A source database's transactions as Debezium emits them with ``provide.transaction.metadata``.

A shop: customers, orders and order lines; each transaction places an order with its lines and
adds it to the customer's balance, amends a line (and the order's total and the balance), cancels
an order with its lines, or adds a customer. Every change event carries its ``transaction`` block;
``BEGIN`` and ``END`` (with ``event_count``) go to the transaction topic. :meth:`Source.deliver`
hands the events out as Kafka would: each topic in its own order, each micro-batch ending anywhere
in each topic. Used by tests/integration/test_debezium_transactions.py and the model check
(tests/model/transactions_steps.py).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

TABLES = ("customers", "orders", "lines")
TX_TOPIC = "shop.transaction"
#: The Kafka rows' Spark schema.
SCHEMA = "key string, value string, topic string, partition int, offset long"
#: The source's columns of each table (a routed batch of events without a schema part gives every
#: table the batch's columns: the others are null).
COLUMNS = {"customers": ("balance",), "orders": ("customer", "total"), "lines": ("order_id", "amount")}

State = dict[str, dict[int, dict[str, Any]]]


def transaction_of(event: dict[str, Any]) -> str:
    """The xid of a change or boundary event (the part of its id before the colon)."""
    return str((event.get("transaction") or event).get("id", "")).split(":")[0]


def canonical(value: Any) -> Any:
    """Money as text, one spelling per amount (``12.50`` and ``12.5`` alike)."""
    if isinstance(value, Decimal):
        value = str(value)
    if isinstance(value, str) and value.lstrip("-").replace(".", "", 1).isdigit():
        return str(Decimal(value).normalize())
    return value


def rows_of(table: str, rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """A table's rows as read back (every column), as the source's state holds them."""
    return {row["id"]: {c: canonical(row[c]) for c in COLUMNS[table]} for row in rows}


def expected(state: State) -> State:
    return {t: {k: {c: canonical(v) for c, v in row.items()} for k, row in rows.items()} for t, rows in state.items()}


class Source:
    """A shop database's transactions and the Debezium events they produce, in commit order."""

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)
        self.state: State = {t: {} for t in TABLES}
        self.states: list[State] = [self._copy()]  # after 0, 1, 2, ... transactions
        self.events: dict[str, list[dict[str, Any]]] = {f"shop.public.{t}": [] for t in TABLES}
        self.events[TX_TOPIC] = []
        self.lsn = 1000
        self.next_id = {t: 1 for t in TABLES}
        self.places: list[list[tuple[str, int]]] = []  # per transaction: (topic, offset) of its events and END
        self.delivered: dict[str, int] = {}  # per topic: events delivered

    @classmethod
    def run(cls, seed: int, transactions: int) -> Source:
        """A source that ran ``transactions`` transactions."""
        source = cls(seed)
        for _ in range(transactions):
            source.transaction()
        return source

    def _copy(self) -> State:
        return {t: {k: dict(v) for k, v in rows.items()} for t, rows in self.state.items()}

    def transaction(self) -> None:
        r = self.random
        xid = len(self.states)
        changes: list[tuple[str, str, dict[str, Any] | None, dict[str, Any] | None]] = []

        def change(table: str, key: int, row: dict[str, Any] | None) -> None:
            before = self.state[table].get(key)
            op = "c" if before is None else "d" if row is None else "u"
            after = None if row is None else {"id": key, **row}
            changes.append((table, op, None if before is None else {"id": key, **before}, after))
            if row is None:
                del self.state[table][key]
            else:
                self.state[table][key] = dict(row)

        def money() -> Decimal:
            return Decimal(r.randint(1, 9999)) / 100

        kind = r.choice(["order", "order", "amend", "cancel", "customer"])
        orders = sorted(self.state["orders"])
        if kind == "customer" or not self.state["customers"]:
            key = self._new("customers")
            change("customers", key, {"balance": "0.00"})
        elif kind == "order" or not orders:
            customer = r.choice(sorted(self.state["customers"]))
            order = self._new("orders")
            amounts = [money() for _ in range(r.randint(1, 4))]
            change("orders", order, {"customer": customer, "total": str(sum(amounts))})
            for amount in amounts:
                change("lines", self._new("lines"), {"order_id": order, "amount": str(amount)})
            self._add_balance(change, customer, sum(amounts))
        else:
            order = r.choice(orders)
            row = self.state["orders"][order]
            lines = sorted(k for k, v in self.state["lines"].items() if v["order_id"] == order)
            if kind == "amend" and lines:
                line = r.choice(lines)
                old, new = Decimal(self.state["lines"][line]["amount"]), money()
                change("lines", line, {"order_id": order, "amount": str(new)})
                change("orders", order, {**row, "total": str(Decimal(row["total"]) - old + new)})
                self._add_balance(change, row["customer"], new - old)
            else:
                for line in lines:
                    change("lines", line, None)
                change("orders", order, None)
                self._add_balance(change, row["customer"], -Decimal(row["total"]))
        self._emit(xid, changes)
        self.states.append(self._copy())

    def _new(self, table: str) -> int:
        self.next_id[table] += 1
        return self.next_id[table] - 1

    def _add_balance(self, change: Any, customer: int, amount: Decimal) -> None:
        change("customers", customer, {"balance": str(Decimal(self.state["customers"][customer]["balance"]) + amount)})

    def _emit(self, xid: int, changes: list[tuple[str, str, Any, Any]]) -> None:
        """As PostgreSQL's connector names them: ``<xid>:<lsn>``, the LSN of the event at hand (the
        BEGIN's, each change's, the commit's), so only the xid is the same for all of them."""
        begin = {"status": "BEGIN", "id": f"{xid}:{self.lsn}", "event_count": None, "data_collections": None}
        self.events[TX_TOPIC].append(begin)
        per_table: dict[str, int] = {}
        places = []
        for n, (table, op, before, after) in enumerate(changes, start=1):
            self.lsn += 8
            per_table[table] = per_table.get(table, 0) + 1
            event = {
                "before": before,
                "after": after,
                "op": op,
                "ts_ms": 1_700_000_000_000,
                "source": {"db": "shop", "schema": "public", "table": table, "lsn": self.lsn},
                "transaction": {"id": f"{xid}:{self.lsn}", "total_order": n, "data_collection_order": per_table[table]},
            }
            self.events[f"shop.public.{table}"].append(event)
            places.append((f"shop.public.{table}", len(self.events[f"shop.public.{table}"]) - 1))
        self.events[TX_TOPIC].append(
            {
                "status": "END",
                "id": f"{xid}:{self.lsn + 4}",
                "event_count": len(changes),
                "data_collections": [
                    {"data_collection": f"public.{t}", "event_count": c} for t, c in per_table.items()
                ],
            }
        )
        places.append((TX_TOPIC, len(self.events[TX_TOPIC]) - 1))
        self.places.append(places)

    def resend(self, first: int) -> None:
        """A connector restarted after transaction ``first``: it re-sends every event from there on (each
        topic gets them again after what it holds, boundary events included)."""
        for places in self.places[first:]:
            for topic, offset in places:
                if topic == TX_TOPIC:  # the END: its BEGIN is the event before it
                    self.events[topic].append(self.events[topic][offset - 1])
                self.events[topic].append(self.events[topic][offset])

    def deliver(self, share: float = 1.0) -> list[tuple[str | None, str, str, int, int]]:
        """The next undelivered events as Kafka rows (key, value, topic, partition, offset): of each
        topic, a random number of its next events (all of them with ``share`` 1), each
        topic at its own pace, shuffled as a micro-batch's partitions interleave."""
        rows = []
        for topic, events in self.events.items():
            start = self.delivered.get(topic, 0)
            left = len(events) - start
            end = start + (left if share >= 1 else self.random.randint(0, max(0, int(left * share) + 1)))
            end = min(end, len(events))
            for offset in range(start, end):
                event = events[offset]
                key = (event.get("after") or event.get("before") or {}).get("id", event.get("id"))
                rows.append((json.dumps({"id": key}), json.dumps(event), topic, 0, offset))
            self.delivered[topic] = end
        self.random.shuffle(rows)
        return rows

    def deliveries(self, batches: int) -> Iterator[list[tuple[str | None, str, str, int, int]]]:
        """Every event cut into ``batches`` micro-batches, each topic cut at its own places (delivered
        as the iteration asks for them)."""
        for b in range(batches):
            yield self.deliver(1.0 if b == batches - 1 else 1.0 / (batches - b))

    def complete_prefix(self) -> int:
        """The source transactions a transaction-consistent sink has committed after the deliveries so
        far: the longest prefix of transactions whose events and END have all been delivered."""
        done = 0
        for places in self.places:
            if any(offset >= self.delivered.get(topic, 0) for topic, offset in places):
                break
            done += 1
        return done
