"""LG-FedAvg: its parameters (:mod:`.params`)."""
