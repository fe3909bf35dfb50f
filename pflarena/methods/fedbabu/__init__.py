"""FedBABU: its parameters (:mod:`.params`)."""
