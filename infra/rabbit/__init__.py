"""RabbitMQ adapters: topology, the confirming publisher, the consumer loop."""
