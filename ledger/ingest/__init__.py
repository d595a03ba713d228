"""Ingest: fold a batch of consumed messages into the ledger store, exactly once.

`Ingestor.apply` (`ledger.ingest.ingestor`) is what a stream agent calls with the messages of
one batch. Messages are routed by topic: the admin topic carries admin events (fold:
`ledger.ingest.admin`), the jobs topic carries holds and the scheduler's GPU assignments
(`ledger.ingest.jobs`; its other job events are passed over), every other topic carries GPU
samples (`ledger.ingest.samples`). For each route, in one store commit:
1. skip messages at offsets the store has already applied for this broker incarnation;
2. decode each message (bad input becomes a dead letter, never an exception);
3. load the route's view from the store, once (`LedgerStore.load_view`);
4. fold: a pure function of the decoded events, the view and the rules (prices, cost centres,
   idle policy) returning a `Folded`: transactions, state changes, idle states, alerts, dead
   letters. Events whose id the store has applied before (and repeats within the batch) are
   dropped there;
5. validate every transaction (`ledger.ingest.validation`): a refused one becomes a dead letter
   with its reason and is never committed;
6. commit transactions, offset ranges, state, dead letters, the outbox (alerts, dead letters
   and changed balances to publish) and the route's messages themselves (the raw-event archive)
   in one store transaction: one batch of the archive per route and call.

Everything a route's fold reads is itself the fold of earlier batches, so replaying the archive
batch by batch, each batch's messages in their archived order, reproduces the ledger
(`ledger.store.rebuild`). A sample is attributed by the GPU assignment timeline as folded when
its batch is applied: the scheduler publishes an assignment before it starts the job, so the
assignment normally precedes the job's samples, and a replay attributes the same way.

Admin events take effect in offset order within a batch. A batch that closes a period seals the
store first, so the close's checksum covers every posting booked into the period, including
those of the same batch before the close; postings after it go to the next open period.

An ingestor writes a whole ledger, or one shard of it (`ledger.ingest.shards`: `ShardRole`);
a shard commits only what `kept_by` keeps of each route's fold.

The broker incarnation (the Kafka cluster id) scopes offsets: an embedded broker restarted with
empty partitions is a new incarnation, so its offset 0 is new data, not something already seen.
"""

from ledger.ingest.ingestor import Ingestor, IngestResult, InputTopics, OutputTopics
from ledger.ingest.shards import ShardRole, ShardRoleError
from ledger.store.port import ConsumedMessage

__all__ = [
    "ConsumedMessage",
    "IngestResult",
    "Ingestor",
    "InputTopics",
    "OutputTopics",
    "ShardRole",
    "ShardRoleError",
]
