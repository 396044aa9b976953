// Kafka's share consumer (KIP-932) as members of one share group, for tests/support/apache_kafka/share_client.py.
//
//   java -cp <kafka jars>:<dir> ShareConsume BOOTSTRAP TOPIC GROUP MEMBERS ACCEPTS TIMEOUT_S
//
// Starts MEMBERS KafkaShareConsumers in group GROUP (explicit acknowledgement), each subscribed to TOPIC, each
// in a thread of its own. Every record's value is a number v; a member acknowledges what it gets:
//   v % 10 == 7                    REJECT  (never delivered again)
//   v % 10 == 3, first delivery    RELEASE (delivered again, to some member)
//   otherwise                      ACCEPT
// committing (commitSync) after each poll, until ACCEPTS records were accepted in all or TIMEOUT_S pass, then
// polls 3 s more and closes. Prints one fact per line:
//   got <member> <partition> <offset> <value> <delivery count> <ACCEPT|RELEASE|REJECT>
//   failed <member> <partition> <error>          (an acknowledgement its commit reported failed)
//   done <accepted>
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicInteger;

import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.serialization.StringDeserializer;

public class ShareConsume {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1], group = args[2];
        int members = Integer.parseInt(args[3]), accepts = Integer.parseInt(args[4]);
        long deadline = System.currentTimeMillis() + Long.parseLong(args[5]) * 1000;
        AtomicInteger accepted = new AtomicInteger();
        List<Thread> threads = new ArrayList<>();
        for (int m = 0; m < members; m++) {
            final int member = m;
            Thread t = new Thread(() -> consume(bootstrap, topic, group, member, accepts, deadline, accepted));
            t.start();
            threads.add(t);
        }
        for (Thread t : threads) t.join();
        System.out.println("done " + accepted.get());
    }

    static void consume(String bootstrap, String topic, String group, int member, int accepts, long deadline, AtomicInteger accepted) {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("group.id", group);
        p.put("client.id", "share-" + member);
        p.put("share.acknowledgement.mode", "explicit");
        p.put("key.deserializer", StringDeserializer.class.getName());
        p.put("value.deserializer", StringDeserializer.class.getName());
        try (KafkaShareConsumer<String, String> consumer = new KafkaShareConsumer<>(p)) {
            consumer.subscribe(List.of(topic));
            long until = deadline;
            while (System.currentTimeMillis() < until) {
                ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(500));
                for (ConsumerRecord<String, String> r : records) {
                    long v = Long.parseLong(r.value());
                    short delivery = r.deliveryCount().orElse((short) -1);
                    AcknowledgeType how = v % 10 == 7 ? AcknowledgeType.REJECT
                        : v % 10 == 3 && delivery == 1 ? AcknowledgeType.RELEASE : AcknowledgeType.ACCEPT;
                    consumer.acknowledge(r, how);
                    if (how == AcknowledgeType.ACCEPT) accepted.incrementAndGet();
                    say("got " + member + " " + r.partition() + " " + r.offset() + " " + v + " " + delivery + " " + how.name());
                }
                if (!records.isEmpty()) {
                    Map<TopicIdPartition, Optional<KafkaException>> results = consumer.commitSync();
                    for (Map.Entry<TopicIdPartition, Optional<KafkaException>> e : results.entrySet()) {
                        e.getValue().ifPresent(x -> say("failed " + member + " " + e.getKey().partition() + " " + x));
                    }
                }
                if (accepted.get() >= accepts && until == deadline) until = System.currentTimeMillis() + 3000;
            }
        }
    }

    static synchronized void say(String line) {
        System.out.println(line);
    }
}
