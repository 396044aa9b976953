"""Kafka backends kfan talks to: cluster model, broker links and the embedded mock cluster."""
