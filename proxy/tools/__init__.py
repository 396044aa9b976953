"""Tools around kfan, never imported by the serving path: the bench, the embedded cluster's driver,
the demo, pcap import and live replay."""
