"""The table of requests: each request's current state, as its latest event says it, in a compacted topic.

`adapterd jobs` and `adapterd get` and each fleet host's view read what the fleet holds now from it, not every
event ever said (Kafka's own answer for "the current state of each key": a compacted topic read as a table, as
Kafka Streams' KTable and ksqlDB's tables are). It is derived, never the record: the events topic stays the audit
log, and the table is a fold of it (`entry.folded`), so whatever is lost or late in the table is folded again from
the events.

- entry.py: one request's state (`TableEntry`) and the fold of an event into it;
- codec.py: an entry as a signed record of the state topic, and back (verified as events are);
- topic.py: the state topic's compaction settings and the keepers' group;
- kept.py: one events partition's entries as its keeper holds them: restored, folded, swept (no Kafka);
- keeper.py: the keeper, every daemon's: the state topic kept as the fold of the events topic (a KTable);
- reader.py: the one reader of the table: its entries, and the events past it folded on top (all, or one request's);
"""
