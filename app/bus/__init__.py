"""Scale-out on NATS JetStream: readings published to partitions, workers that lease them."""
