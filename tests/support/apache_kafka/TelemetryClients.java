// A Java producer and consumer that live long enough to push their metrics (KIP-714), for
// tests/test_client_telemetry.py.
//
//   java -cp <kafka jars>:<dir> TelemetryClients BOOTSTRAP TOPIC GROUP SECONDS
//
// The producer (client.id java-telemetry-producer) sends a record every 100 ms while the consumer (client.id
// java-telemetry-consumer, in GROUP) polls, for at least SECONDS and until the consumer has read a record (at
// most 120 s: joining a group takes seconds on a loaded machine); then both close (a terminating push each).
// Prints "produced <n>" and "consumed <n>".
import java.time.Duration;
import java.util.List;
import java.util.Properties;

import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class TelemetryClients {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1], group = args[2];
        long start = System.currentTimeMillis();
        long until = start + Long.parseLong(args[3]) * 1000, cap = start + 120_000;
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("client.id", "java-telemetry-producer");
        Properties c = new Properties();
        c.put("bootstrap.servers", bootstrap);
        c.put("client.id", "java-telemetry-consumer");
        c.put("group.id", group);
        c.put("auto.offset.reset", "earliest");
        int produced = 0, consumed = 0;
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(p, new StringSerializer(), new StringSerializer());
             KafkaConsumer<String, String> consumer = new KafkaConsumer<>(c, new StringDeserializer(), new StringDeserializer())) {
            consumer.subscribe(List.of(topic));
            while (System.currentTimeMillis() < cap && (System.currentTimeMillis() < until || consumed == 0)) {
                producer.send(new ProducerRecord<>(topic, "v" + produced++));
                consumed += consumer.poll(Duration.ofMillis(100)).count();
            }
        }
        System.out.println("produced " + produced);
        System.out.println("consumed " + consumed);
    }
}
