"""Cell-budget admission: new prefills admitted against the KV the admitted
sequences may still need, so decoding programs are not preempted."""
