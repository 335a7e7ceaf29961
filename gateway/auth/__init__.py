"""Who a connection is: listeners, TLS and SASL (PLAIN, SCRAM-SHA-256/512).

`listeners` parses Kafka's listener settings, `tls` builds the server's TLS context and
names certificate subjects, `scram` and `session` run the SASL exchanges against the
SCRAM credentials the coordinator keeps.
"""
