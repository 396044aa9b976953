// A Kafka Streams application on the streams rebalance protocol (KIP-1071), for tests/test_streams_groups.py.
//
//   java -cp <kafka jars>:<dir> StreamsApp BOOTSTRAP APPLICATION_ID INPUT OUTPUT EXPECTED TIMEOUT_S
//
// Two instances (KafkaStreams objects, one stream thread each) of one application, group.protocol=streams,
// exactly_once_v2: each record v of INPUT becomes "v-processed" in OUTPUT. Runs until EXPECTED records were
// processed in all or TIMEOUT_S pass, then closes both. Prints:
//   state <instance> <state>        (each instance's state changes)
//   processed <count>
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicInteger;

import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;

public class StreamsApp {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], app = args[1], input = args[2], output = args[3];
        int expected = Integer.parseInt(args[4]);
        long deadline = System.currentTimeMillis() + Long.parseLong(args[5]) * 1000;
        AtomicInteger processed = new AtomicInteger();
        List<KafkaStreams> instances = new ArrayList<>();
        for (int i = 0; i < 2; i++) {
            Properties p = new Properties();
            p.put(StreamsConfig.APPLICATION_ID_CONFIG, app);
            p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            p.put(StreamsConfig.GROUP_PROTOCOL_CONFIG, "streams");
            p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
            p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 200);
            p.put(StreamsConfig.STATE_DIR_CONFIG, System.getProperty("java.io.tmpdir") + "/" + app + "-" + i);
            p.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
            p.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
            p.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
            StreamsBuilder builder = new StreamsBuilder();
            builder.<String, String>stream(input).mapValues(v -> {
                processed.incrementAndGet();
                return v + "-processed";
            }).to(output);
            KafkaStreams streams = new KafkaStreams(builder.build(), p);
            final int instance = i;
            streams.setStateListener((now, before) -> say("state " + instance + " " + now));
            instances.add(streams);
            streams.start();
        }
        while (System.currentTimeMillis() < deadline && processed.get() < expected) Thread.sleep(200);
        Thread.sleep(1000);  // the last commit
        for (KafkaStreams s : instances) s.close(Duration.ofSeconds(30));
        say("processed " + processed.get());
    }

    static synchronized void say(String line) {
        System.out.println(line);
    }
}
