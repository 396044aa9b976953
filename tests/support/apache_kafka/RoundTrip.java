// The reference Java client's round trip, for tests/support/apache_kafka/java_client.py.
//
//   java -cp <kafka jars>:<dir> RoundTrip BOOTSTRAP TOPIC GROUP N PROTOCOL ABORTED
//
// Produces N keyed records (key-<i % 500>, value <i>) with an idempotent producer
// (acks=all); with ABORTED > 0, a transactional producer writes the N records in
// one committed transaction and ABORTED more in an aborted one. Then reads them
// back as the only member of group GROUP (group.protocol PROTOCOL: classic or
// consumer), read_committed, committing as it goes, until N records are in or 90 s
// pass, polls 2 s more, and prints what it saw, one fact per line:
//   record <partition> <offset> <key> <value>
//   extra <partition> <offset> <key> <value>     (after the N were in)
//   broker <id> <host> <port>                    (the cluster as the client sees it)
//   partitions <count>                            (the topic's, in the client's metadata)
//   assigned <partition>
//   committed <partition> <offset>
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.Future;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.ListOffsetsResult;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class RoundTrip {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1], group = args[2];
        int n = Integer.parseInt(args[3]);
        String protocol = args[4];
        int aborted = Integer.parseInt(args[5]);

        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        if (aborted > 0) {
            p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, "tx-" + group);
        }
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(p, new StringSerializer(), new StringSerializer())) {
            if (aborted > 0) {
                producer.initTransactions();
                producer.beginTransaction();
            }
            List<Future<RecordMetadata>> sent = new ArrayList<>();
            for (int i = 0; i < n; i++) {
                sent.add(producer.send(new ProducerRecord<>(topic, "key-" + (i % 500), Integer.toString(i))));
            }
            if (aborted > 0) {
                producer.commitTransaction();
                producer.beginTransaction();
                for (int i = 0; i < aborted; i++) {
                    producer.send(new ProducerRecord<>(topic, "key-" + (i % 500), "aborted-" + i));
                }
                producer.flush();
                producer.abortTransaction();
            }
            producer.flush();
            for (Future<RecordMetadata> f : sent) {
                f.get();
            }
        }

        Properties a = new Properties();
        a.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        try (Admin admin = Admin.create(a)) {
            for (Node node : admin.describeCluster().nodes().get()) {
                System.out.println("broker " + node.id() + " " + node.host() + " " + node.port());
            }
        }

        Properties c = new Properties();
        c.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        c.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        c.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, protocol);
        c.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        c.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        c.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(c, new StringDeserializer(), new StringDeserializer())) {
            consumer.subscribe(List.of(topic));
            int got = 0;
            long deadline = System.nanoTime() + Duration.ofSeconds(90).toNanos();
            while (got < n && System.nanoTime() < deadline) {
                for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(500))) {
                    System.out.println("record " + r.partition() + " " + r.offset() + " " + r.key() + " " + r.value());
                    got++;
                }
                consumer.commitSync();
            }
            long extraUntil = System.nanoTime() + Duration.ofSeconds(2).toNanos();
            while (System.nanoTime() < extraUntil) {
                for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(200))) {
                    System.out.println("extra " + r.partition() + " " + r.offset() + " " + r.key() + " " + r.value());
                }
            }
            consumer.commitSync();
            System.out.println("partitions " + consumer.partitionsFor(topic).size());
            Set<TopicPartition> assigned = consumer.assignment();
            for (TopicPartition tp : assigned) {
                System.out.println("assigned " + tp.partition());
            }
            for (Map.Entry<TopicPartition, OffsetAndMetadata> e : consumer.committed(assigned).entrySet()) {
                if (e.getValue() != null) {
                    System.out.println("committed " + e.getKey().partition() + " " + e.getValue().offset());
                }
            }
        }

        // The admin client's view of the same group and topic, once the member has left:
        // OffsetFetch, DescribeGroups or ConsumerGroupDescribe (by the group's protocol), ListOffsets.
        try (Admin admin = Admin.create(a)) {
            for (Map.Entry<TopicPartition, OffsetAndMetadata> e : admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get().entrySet()) {
                System.out.println("admin-committed " + e.getKey().partition() + " " + e.getValue().offset());
            }
            ConsumerGroupDescription described = admin.describeConsumerGroups(List.of(group)).describedGroups().get(group).get();
            System.out.println("admin-group " + described.groupState() + " " + described.members().size() + " " + described.type());
            Map<TopicPartition, OffsetSpec> latest = new HashMap<>();
            int count = admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic).partitions().size();
            for (int i = 0; i < count; i++) {
                latest.put(new TopicPartition(topic, i), OffsetSpec.latest());
            }
            for (Map.Entry<TopicPartition, ListOffsetsResult.ListOffsetsResultInfo> e : admin.listOffsets(latest).all().get().entrySet()) {
                System.out.println("admin-end " + e.getKey().partition() + " " + e.getValue().offset());
            }
        }
    }
}
