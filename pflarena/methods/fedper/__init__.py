"""FedPer: its parameters (:mod:`.params`)."""
