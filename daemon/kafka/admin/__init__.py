"""The cluster's administration, beside the data path: topics created, who may write them (ACLs), a
group's committed offsets and the consumer lag read from outside the group."""
